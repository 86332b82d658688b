"""`kvlab bench`: a kvlab workload replayed against a real OpenAI-compatible server, measured beside the simulator."""
