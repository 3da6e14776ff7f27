"""spectrace.tui"""
