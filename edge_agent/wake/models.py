"""microWakeWord models: the built-in ones and a user's own `.json` + `.tflite`, checked before use.

A model is described by a JSON file (`wake_word`, `model`: the `.tflite` beside it,
`micro.probability_cutoff`, `micro.sliding_window_size`). The TensorFlow Lite C
library crashes the whole process on a file that is not a model (pymicro-wakeword
hands its NULL model straight to the interpreter), so every custom model is first
test-loaded in a child process (`python -m edge_agent.wake.models FILE.json`) and
only then in ours; the built-in ones ship inside the wheel and are trusted.
"""

from __future__ import annotations

import ctypes
import json
import math
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edge_agent.errors import ModelError
from edge_agent.wake.settings import WAKE_BUILTIN, WakeSettings

TUNED_CUTOFFS: dict[str, float] = {"alexa": 0.85}
"""Built-in models whose cutoff was chosen on recordings of real people, replacing the model's own
(`wake.probability_cutoff` still overrides it). `alexa` (own 0.9): the lowest cutoff with no false
accept on real people's other words, alone (1,964 clips: highest 0.625) and said in a simulated
room under three other talkers at 10 dB (1.8 h heard at two places: 0.7 woke 6 times, 0.8 twice,
0.85 never). On 236 people in that room it finds 0.708 against 0.674 at 0.9, and 0.936 against
0.898 without the other talkers (docs/benchmarks.md, `bench hear --real`; the 79 held out: 0.671
against 0.62, 0.911 against 0.835). The other built-in models have no real recordings of their
phrase to tune on, so they keep their own."""
MAX_MODEL_BYTES = 16 * 1024 * 1024
"""The built-in models are 50-70 kB; a larger file is not a microWakeWord model."""
MAX_CONFIG_BYTES = 64 * 1024
PROBE_TIMEOUT_S = 30.0
FEATURES = 40
"""Mel features per 10 ms step produced by the microWakeWord front end."""


@dataclass(frozen=True)
class WakeModelSpec:
    """What a model is and where its files are."""

    name: str
    """The `.tflite` file's stem (`okay_nabu`): the id in config, events and metrics."""
    wake_word: str
    """The phrase as people say it (`Okay Nabu`)."""
    config_path: Path
    tflite_path: Path
    probability_cutoff: float
    """Fire when the mean probability over the sliding window is above this."""
    sliding_window_size: int
    builtin: bool


def builtin_dir() -> Path:
    """Where pymicro-wakeword keeps its models."""
    import pymicro_wakeword

    return Path(pymicro_wakeword.__file__).parent / "models"


def resolve(entry: str, overrides: dict[str, float] | None = None,
            windows: dict[str, int] | None = None) -> WakeModelSpec:
    """The model `entry` names: a built-in name or the path of a model's `.json`; `overrides` and
    `windows` replace its cutoff and sliding window by model name."""
    if entry in WAKE_BUILTIN:
        spec = read_config(builtin_dir() / f"{entry}.json", builtin=True)
        if entry in TUNED_CUTOFFS:
            spec = replace(spec, probability_cutoff=TUNED_CUTOFFS[entry])
    else:
        path = Path(entry).expanduser()
        if path.suffix != ".json":
            raise ModelError(f"wake model {entry!r}: not a built-in name ({', '.join(WAKE_BUILTIN)}) "
                             "nor a microWakeWord model's .json file")
        spec = read_config(path, builtin=False)
    cutoff = (overrides or {}).get(spec.name)
    if cutoff is not None:
        spec = replace(spec, probability_cutoff=cutoff)
    window = (windows or {}).get(spec.name)
    if window is not None:
        spec = replace(spec, sliding_window_size=window)
    return spec


def read_config(path: Path, builtin: bool = False) -> WakeModelSpec:
    """Parse and check a model's JSON; every error names the file and what is wrong with it."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelError(f"wake model {path}: {exc.strerror or exc}") from None
    if size > MAX_CONFIG_BYTES:
        raise ModelError(f"wake model {path}: {size} bytes is too large for a model description")
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, OSError) as exc:
        raise ModelError(f"wake model {path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ModelError(f"wake model {path}: expected a JSON object")
    micro = doc.get("micro")
    wake_word, model = doc.get("wake_word"), doc.get("model")
    if not isinstance(wake_word, str) or not wake_word.strip():
        raise ModelError(f"wake model {path}: 'wake_word' must be a non-empty string")
    if not isinstance(model, str) or not model.endswith(".tflite") or "/" in model or "\\" in model:
        raise ModelError(f"wake model {path}: 'model' must name a .tflite file beside it")
    if not isinstance(micro, dict):
        raise ModelError(f"wake model {path}: 'micro' settings are missing")
    cutoff, window = micro.get("probability_cutoff"), micro.get("sliding_window_size")
    if not isinstance(cutoff, int | float) or not _number(cutoff) or not 0.0 < cutoff < 1.0:
        raise ModelError(f"wake model {path}: micro.probability_cutoff must be a number in 0..1")
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= 100:
        raise ModelError(f"wake model {path}: micro.sliding_window_size must be an integer in 1..100")
    tflite = path.parent / model
    try:
        tflite_size = tflite.stat().st_size
    except OSError as exc:
        raise ModelError(f"wake model {tflite}: {exc.strerror or exc} (named by {path.name})") from None
    if not 0 < tflite_size <= MAX_MODEL_BYTES:
        raise ModelError(f"wake model {tflite}: {tflite_size} bytes is not a microWakeWord model")
    return WakeModelSpec(Path(model).stem, wake_word.strip(), path, tflite, float(cutoff), window, builtin)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def library_path() -> Path:
    """The TensorFlow Lite C library inside the pymicro-wakeword wheel."""
    found = sorted(builtin_dir().parent.joinpath("lib").glob("*tensorflowlite_c.*"))
    if not found:
        raise ModelError("pymicro-wakeword has no TensorFlow Lite library for this platform")
    return found[0]


def check_tflite(path: Path) -> None:
    """Load `path` with the TFLite C API and check its tensors, in this process.

    TfLiteModelCreateFromFile verifies the flatbuffer and returns NULL for a bad one;
    the checks after it catch models that load but are not wake word detectors.
    """
    from pymicro_wakeword.wakeword import TfLiteWakeWord

    lib = TfLiteWakeWord(library_path()).lib
    model = lib.TfLiteModelCreateFromFile(str(path).encode())
    if not model:
        raise ModelError(f"wake model {path}: not a TensorFlow Lite model (the flatbuffer does not verify)")
    interpreter = None
    try:
        interpreter = lib.TfLiteInterpreterCreate(model, None)
        if not interpreter:
            raise ModelError(f"wake model {path}: TensorFlow Lite cannot build an interpreter for it")
        if lib.TfLiteInterpreterAllocateTensors(interpreter) != 0:
            raise ModelError(f"wake model {path}: TensorFlow Lite cannot allocate its tensors")
        tensor_in = lib.TfLiteInterpreterGetInputTensor(interpreter, 0)
        tensor_out = lib.TfLiteInterpreterGetOutputTensor(interpreter, 0)
        if not tensor_in or not tensor_out:
            raise ModelError(f"wake model {path}: has no input or output tensor")
        quantized = (3, 9)  # kTfLiteUInt8, kTfLiteInt8
        if (lib.TfLiteTensorType(tensor_in) not in quantized
                or lib.TfLiteTensorType(tensor_out) not in quantized):
            raise ModelError(f"wake model {path}: tensors are not quantized to 8 bits (not microWakeWord)")
        dims = [lib.TfLiteTensorDim(tensor_in, i) for i in range(lib.TfLiteTensorNumDims(tensor_in))]
        if len(dims) != 3 or dims[2] != FEATURES:
            raise ModelError(f"wake model {path}: input shape {dims} is not [1, stride, {FEATURES}]")
    finally:
        if interpreter:
            lib.TfLiteInterpreterDelete(ctypes.c_void_p(interpreter))
        lib.TfLiteModelDelete(ctypes.c_void_p(model))


def probe(spec: WakeModelSpec) -> None:
    """Test-load a custom model in a child process first (a hostile file can crash TFLite)."""
    if spec.builtin:
        return
    try:
        result = subprocess.run([sys.executable, "-m", "edge_agent.wake.models", str(spec.config_path)],
                                capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ModelError(f"wake model {spec.tflite_path}: loading it took over "
                         f"{PROBE_TIMEOUT_S:.0f} s") from None
    if result.returncode == 0:
        return
    lines = [line for line in result.stderr.splitlines() if line.startswith("wake model ")]
    if lines:
        raise ModelError(lines[-1])
    raise ModelError(f"wake model {spec.tflite_path}: TensorFlow Lite crashed loading it "
                     f"(exit status {result.returncode})")


def check_all(settings: WakeSettings) -> list[WakeModelSpec]:
    """Resolve and check every configured model; the first bad one raises `ModelError`."""
    specs = [resolve(entry, settings.probability_cutoff, settings.sliding_window)
             for entry in settings.models]
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ModelError(f"wake.models: a model is named twice ({', '.join(names)})")
    for spec in specs:
        probe(spec)
    return specs


def main(argv: list[str]) -> int:
    """Child-process check: exit 0 when every model loads, 2 with the reason on stderr."""
    for arg in argv:
        try:
            spec = read_config(Path(arg))
            check_tflite(spec.tflite_path)
        except ModelError as exc:
            print(exc, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
