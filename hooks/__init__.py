"""spectrace.hooks"""
