package limiter

// LoneInFlight is how many lone calls the store has in flight (tests wait
// for one before sending a call that must join the autopipeliner's batch).
func (s *RedisStore) LoneInFlight() int64 { return s.lone.Load() }

// LoneDirect is how many lone calls go straight to a connection at once.
const LoneDirect = loneDirect
