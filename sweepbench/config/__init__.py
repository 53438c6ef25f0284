"""Config schemas, their registration in the ConfigStore, and cross-field validation."""
