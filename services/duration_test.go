package services

import (
	"strings"
	"testing"
	"time"
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

// TestFormatDuration: policy durations print as typed, and ParseDuration reads each back.
func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		400 * 24 * time.Hour: "400d", 36 * time.Hour: "36h", time.Hour: "1h", 90 * time.Minute: "1h30m",
		45 * time.Second: "45s", 90 * time.Second: "1m30s", 3661 * time.Second: "1h1m1s", 0: "0s",
	} {
		got := FormatDuration(d)
		if got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		if back, err := ParseDuration(got); err != nil || back != d {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", got, back, err, d)
		}
	}
}
