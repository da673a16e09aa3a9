# Puts the repository root on sys.path so tests can import `tests.*` and `models.*`.
import os

# TensorFlow turns its oneDNN kernels on by default only on CPUs with AVX-512 VNNI/BF16 or
# AMX; elsewhere (an AVX2-only AMD Zen 3, 2026-11-28) its Eigen kernels take over and
# refuse some cases the tests compare against ("Current CPU implementations do not yet
# support dilation rates larger than 1": a dilated Conv3D, Conv2DBackpropInput). The tests
# hold us to the same TensorFlow kernels on every CPU. Set before anything imports it.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
