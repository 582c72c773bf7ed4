"""The run loop: a task's model loop, its driver, approvals, verification and run record."""
