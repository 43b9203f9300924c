"""codegen layer."""
