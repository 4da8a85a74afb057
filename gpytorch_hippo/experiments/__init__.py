"""Experiment runners that write CSV + PNG and print a table."""
