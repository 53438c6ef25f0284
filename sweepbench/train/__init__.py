"""placeholder: filled by the train engine work."""
