package web

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFormatAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "", -time.Second: "", 45 * time.Second: "45 s", 12*time.Minute + 5*time.Second: "12 min",
		3*time.Hour + 12*time.Minute + 59*time.Second: "3 h 12 min", 52 * time.Hour: "2 d 4 h",
	} {
		require.Equal(t, want, formatAge(d), d.String())
	}
}
