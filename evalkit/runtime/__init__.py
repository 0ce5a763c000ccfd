"""The process a run happens in: the platform and numeric mode that decide the floats, and the run log."""
