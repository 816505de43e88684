package services

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseLingerMode(t *testing.T) {
	for _, m := range []LingerMode{LingerAuto, LingerOn, LingerOff} {
		got, err := ParseLingerMode(m.String())
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	for _, bad := range []string{"", "Auto", "true", "1", " on", "off "} {
		_, err := ParseLingerMode(bad)
		require.Error(t, err, "%q", bad)
		require.Contains(t, err.Error(), "auto, on or off")
	}
}

// FuzzParseLingerMode: a value is accepted only if it is a mode's exact name, and then it names
// that mode.
func FuzzParseLingerMode(f *testing.F) {
	for _, s := range []string{"auto", "on", "off", "", "ON", "of", "auto\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseLingerMode(s)
		if err != nil {
			require.NotContains(t, []string{"auto", "on", "off"}, s)
			return
		}
		require.Equal(t, s, m.String())
	})
}

// skips counts how many lingering() calls say no before one says yes (at most limit).
func skips(c *lingerControl, limit int) int {
	for n := range limit {
		if c.lingering() {
			return n
		}
	}
	return limit
}

// TestLingerControlBacksOffWhenCallersDoNotComeBack: under LingerAuto the slot lingers until a
// linger ends at its bound; then it skips the next one, then 2, 4, … up to lingerMaxSkip for
// each such linger in a row, and a linger that gathers what it waited for ends the backoff.
// Callers that do not come back within a statement's time (they work between acquires, or
// arrive at random) would otherwise keep every acquire caught waiting in a batch waiting a
// statement's time longer, for nothing.
func TestLingerControlBacksOffWhenCallersDoNotComeBack(t *testing.T) {
	c := &lingerControl{mode: LingerAuto}
	for range 10 {
		require.True(t, c.lingering(), "lingers while lingers gather")
		c.lingered(true)
	}
	var got []int
	for range 9 {
		c.lingered(false)
		got = append(got, skips(c, 1000))
	}
	require.Equal(t, []int{1, 2, 4, 8, 16, 32, 64, 64, 64}, got)
	c.lingered(true)
	require.True(t, c.lingering(), "a gathered linger ends the backoff")
	c.lingered(false)
	require.Equal(t, 1, skips(c, 1000), "and it starts over from one")

	for _, m := range []LingerMode{LingerOn, LingerOff} {
		c := &lingerControl{mode: m}
		for range 100 {
			c.lingered(false)
			require.Equal(t, m == LingerOn, c.lingering(), "%s does not back off", m)
		}
	}
}
