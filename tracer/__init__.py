"""spectrace.tracer"""
