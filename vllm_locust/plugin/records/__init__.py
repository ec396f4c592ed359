"""What a run keeps: raw rows to CSV, Locust's CSV writer, the load record, a request's sinks, live buckets."""
