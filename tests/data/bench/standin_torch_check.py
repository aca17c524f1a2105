"""What tools/on-device.sh's torch-tests step runs on the stand-in GPU, in place of the
torch layer's CUDA tests: pytest starts from the project root and sees the stand-in."""
import pytest


def test_the_standin_hides_torch():
    with pytest.raises(ImportError, match="hidden by the stand-in"):
        import torch  # noqa: F401
