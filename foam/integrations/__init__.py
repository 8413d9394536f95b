"""Adapters that put the project's optimizers into other training loops (imported on demand, so
``import foam`` still loads torch alone)."""
