"""Presenting results: rich tables for the terminal and CSV for spreadsheets."""
