# Marks csrc/ as the package `softmax_ops.csrc` so the C++/CUDA sources ship with the wheel and
# softmax_ops/_build.py can find them with importlib; there is no Python code here.
