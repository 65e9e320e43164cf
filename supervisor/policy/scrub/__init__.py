"""The scrubber: credentials found in text and replaced, in whole texts and in streams."""
