"""The pre-training harness: Hydra entry point, training loop and its separately testable parts."""
