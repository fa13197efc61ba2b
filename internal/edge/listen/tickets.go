package listen

import (
	"bytes"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Session-ticket keys from --tls-ticket-keys: one key per line, 64 hex
// digits (32 random bytes, `openssl rand -hex 32`); '#' starts a comment.
// The first key encrypts new tickets, every key decrypts, so a rotation
// puts the new key first and keeps the previous ones for a ticket's
// lifetime. Edges that read the same keys resume each other's sessions (a
// client the L4 balancer moves to another edge of the PoP skips the full
// handshake). The file is re-read when it changes, like the certificates;
// an invalid file is refused and the keys in force stay. Without the flag
// each edge makes and rotates its own keys (crypto/tls's default).
type ticketKeys struct {
	path   string
	config *tls.Config
	stamp  string
}

// load applies the file's keys if it changed since the last load; changed
// says whether it did.
func (k *ticketKeys) load() (n int, changed bool, err error) {
	fi, err := os.Stat(k.path)
	if err != nil {
		return 0, false, err
	}
	stamp := fmt.Sprintf("%d:%d", fi.Size(), fi.ModTime().UnixNano())
	if stamp == k.stamp {
		return 0, false, nil
	}
	k.stamp = stamp // refused or not, read again only once it changes
	data, err := os.ReadFile(k.path)
	if err != nil {
		return 0, true, err
	}
	keys, err := parseTicketKeys(data)
	if err != nil {
		return 0, true, err
	}
	k.config.SetSessionTicketKeys(keys)
	return len(keys), true, nil
}

func parseTicketKeys(data []byte) ([][32]byte, error) {
	var keys [][32]byte
	for i, line := range bytes.Split(data, []byte{'\n'}) {
		s := strings.TrimSpace(string(line))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		b, err := hex.DecodeString(s)
		if err != nil || len(b) != 32 {
			return nil, fmt.Errorf("line %d: a key is 64 hex digits (32 bytes)", i+1)
		}
		var k [32]byte
		copy(k[:], b)
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	return keys, nil
}

// loadTicketKeys applies a changed key file, logging and counting a refusal.
func (e *Certs) loadTicketKeys() error {
	n, changed, err := e.tickets.load()
	if err != nil {
		e.m.refusedFiles.Inc()
		e.log.Error("session ticket keys refused; keeping the keys in force", "file", e.tickets.path, "reason", err)
		return err
	}
	if changed {
		e.log.Info("session ticket keys loaded", "file", e.tickets.path, "keys", n)
	}
	return nil
}

// CheckTicketKeys reads a --tls-ticket-keys file as the TLS listener does
// at start and returns why it would be refused (nil: it would not); `edge
// check` calls it.
func CheckTicketKeys(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	_, err = parseTicketKeys(data)
	return err
}
