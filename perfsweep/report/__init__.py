"""Reporting layer: PNG comparison charts, report.md and runs.csv built from the database."""
