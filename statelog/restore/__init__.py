"""Restore: turning a checkpoint's handles back into a subtask's keyed state."""
