"""Data: tables (CSV, NPZ, synthetic), image files, splits, normalization and augmentation."""
