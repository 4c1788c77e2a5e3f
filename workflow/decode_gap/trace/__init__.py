"""Trace stage: explain a decode step from a torch.profiler Chrome trace (a user's, a server's, the engine level's).

Modules: `load` (files -> event frames), `categories` (kernel name -> category), `steps` (finding decode steps),
`analyze` (per-step figures and trace.json).
"""
