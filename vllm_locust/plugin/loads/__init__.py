"""Load models: open-loop arrivals and their pacing, load steps, trace replay, conversations, the run clock."""
