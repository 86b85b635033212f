"""Data parallelism with DistributedDataParallel: the strategy, its steady buckets and comm hooks."""
