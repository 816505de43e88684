package services

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestOverviewSevenDays: Range7d has 28 six-hour buckets starting at 00, 06, 12 or 18 UTC,
// the last holding now; attempts of the last 7 days land in their bucket, older ones and the
// 24 h range's outside ones are not counted.
func TestOverviewSevenDays(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		ov0, err := b.dash.OverviewFor(bg, &b.p.TenantID, Range7d)
		require.NoError(t, err)
		now := ov0.Now.UTC()
		// Attempts written with past times (acquire stamps the database's now): 2 days, 6
		// days and 8 days ago, and one now.
		at := map[string]time.Time{"d2": now.Add(-48 * time.Hour), "d6": now.Add(-6 * 24 * time.Hour),
			"d8": now.Add(-8 * 24 * time.Hour), "now": now}
		for k, ts := range at {
			require.NoError(t, b.db.Create(&models.Attempt{TenantID: b.p.TenantID, Key: k, Result: ResultDuplicate,
				Caller: "test", AttemptedAt: ts}).Error)
		}

		ov, err := b.dash.OverviewFor(bg, &b.p.TenantID, Range7d)
		require.NoError(t, err)
		require.Equal(t, 6*time.Hour, ov.Bucket)
		require.Len(t, ov.Hours, 28)
		for i, h := range ov.Hours {
			require.Zero(t, h.Start.Hour()%6, "bucket %d starts at 00, 06, 12 or 18", i)
			require.Zero(t, h.Start.Minute())
			if i > 0 {
				require.Equal(t, 6*time.Hour, h.Start.Sub(ov.Hours[i-1].Start))
			}
		}
		last := ov.Hours[27]
		require.False(t, ov.Now.Before(last.Start))
		require.True(t, ov.Now.Before(last.Start.Add(6*time.Hour)))
		bucketOf := func(ts time.Time) int { return int(ts.Sub(ov.Hours[0].Start) / (6 * time.Hour)) }
		var total int64
		for i, h := range ov.Hours {
			total += h.Duplicates
			want := int64(0)
			for k, ts := range at {
				if k != "d8" && bucketOf(ts) == i {
					want++
				}
			}
			require.Equal(t, want, h.Duplicates, "bucket %d", i)
		}
		require.EqualValues(t, 3, total, "8 days ago is outside the range")

		day, err := b.dash.OverviewFor(bg, &b.p.TenantID, Range24h)
		require.NoError(t, err)
		require.Equal(t, time.Hour, day.Bucket)
		require.Len(t, day.Hours, 24)
		var dayTotal int64
		for _, h := range day.Hours {
			dayTotal += h.Duplicates
		}
		require.EqualValues(t, 1, dayTotal, "only now is within 24 hours")
	})
}

func TestParseOverviewRange(t *testing.T) {
	for in, want := range map[string]OverviewRange{"": Range24h, "24h": Range24h, "7d": Range7d} {
		got, err := ParseOverviewRange(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"7D", "1h", "30d", " 7d"} {
		_, err := ParseOverviewRange(in)
		require.ErrorIs(t, err, ErrInvalidRequest, in)
	}
}

// FuzzParseOverviewRange: only the two names parse, and nothing panics.
func FuzzParseOverviewRange(f *testing.F) {
	for _, s := range []string{"", "24h", "7d", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseOverviewRange(s)
		if err == nil && r != Range24h && r != Range7d {
			t.Fatalf("%q parsed to %q", s, r)
		}
		if err == nil && s != "" && s != string(r) {
			t.Fatalf("%q parsed to %q", s, r)
		}
	})
}
