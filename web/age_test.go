package web

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFormatAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 45 * time.Second: "45s", 12*time.Minute + 5*time.Second: "12m",
		3*time.Hour + 5*time.Minute + 59*time.Second: "3h 05m", 52 * time.Hour: "2d 4h",
	} {
		require.Equal(t, want, formatAge(d), d.String())
	}
}
