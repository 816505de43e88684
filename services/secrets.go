package services

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
)

// Secret prefixes make a leaked secret recognisable (e.g. by secret scanners) and tell an
// owner token from an API key at a glance.
const (
	apiKeyPrefix     = "idg_"
	ownerTokenPrefix = "ot_"
)

// newSecret returns prefix + 256 random bits in unpadded base64url (43 characters).
func newSecret(prefix string) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on supported platforms
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// hashSecret returns the hex SHA-256 of a high-entropy secret. A fast hash is right here: the
// secrets are random (≥256 bits), so there is nothing to brute-force, and API keys are checked
// on every request.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// secretMatches compares a presented secret against a stored hash in constant time.
func secretMatches(secret, storedHash string) bool {
	h := hashSecret(secret)
	return subtle.ConstantTimeCompare([]byte(h), []byte(storedHash)) == 1
}
