"""The storage providers: the suite every provider passes, fsync order, S3 and its tiers."""
