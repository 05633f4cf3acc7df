"""The Textual UI. It only reads Snapshots; it never calls NVML."""
