"""The terminal output layer under Textual: only changed cells go out, and never faster than the link."""
