package dynamostore

// SetAllShards spreads the runs s creates over n partitions of the "all"
// index, as raising allShards would, so that tests exercise the merged
// listing that a sharded index takes.
func SetAllShards(s *Store, n int) { s.allShards = n }
