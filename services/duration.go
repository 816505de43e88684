package services

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseDuration reads a duration as the configuration, the command line and the admin page
// take them: "90d" (days, fractions allowed), a Go duration ("1h", "30s", "1h30m"), or bare
// seconds ("3600"), surrounding spaces ignored. Bare seconds and days are refused below 0 and
// above 100 years; Go durations as time.ParseDuration reads them (negative ones too: callers
// bound them). Errors: one naming the text.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 || n > 100*365*24*3600 {
			return 0, fmt.Errorf("seconds out of range: %q", s)
		}
		return time.Duration(n) * time.Second, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(d, 64)
		if err != nil || n < 0 || n > 100*365 {
			return 0, fmt.Errorf("days out of range: %q", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	return time.ParseDuration(s)
}

// FormatDuration writes d as ParseDuration reads it back, in the largest unit that keeps it
// exact: "400d", "36h", "90m", "1h30m", "45s" ("0s" for zero). Policies are typed in days
// ("90d") and must not come back as "2160h0m0s".
func FormatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	s := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if strings.HasSuffix(s, "m"+zero) || strings.HasSuffix(s, "h"+zero) {
			s = strings.TrimSuffix(s, zero)
		}
	}
	return s
}
