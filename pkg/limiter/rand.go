package limiter

import (
	"crypto/rand"
	"encoding/binary"
)

func randUint64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return binary.LittleEndian.Uint64(b[:])
}
