package services

import (
	"strings"
	"testing"
)

// FuzzParseDuration (moved from cli with the parser): never panics, and what it accepts is a
// non-negative duration unless the text starts with a minus.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"30d", "1.5d", "90s", "12h", "3600", "-1", "1e400d", "9223372036854775807", "d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err == nil && d < 0 && !strings.HasPrefix(strings.TrimSpace(s), "-") {
			t.Fatalf("ParseDuration(%q) = %v", s, d)
		}
	})
}
