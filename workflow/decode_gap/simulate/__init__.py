"""Decode simulation at three levels: kernels (kernel.py), the engine's own forward (engine.py) and the
server's transport and completion loop (server.py). gap.py turns them into the waterfall."""
