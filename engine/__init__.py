"""spectrace.engine"""
