package web

import (
	"strconv"
	"time"
)

// formatAge spells a duration the way an operator reads it at a glance: "3 h 12 min",
// "12 min", "45 s", "2 d 4 h"; "" for zero or less. Two units at most: the point is how long,
// not to the second.
func formatAge(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	s := int64(d / time.Second)
	days, hours, mins := s/86400, s%86400/3600, s%3600/60
	switch {
	case days > 0:
		return strconv.FormatInt(days, 10) + " d " + strconv.FormatInt(hours, 10) + " h"
	case hours > 0:
		return strconv.FormatInt(hours, 10) + " h " + strconv.FormatInt(mins, 10) + " min"
	case mins > 0:
		return strconv.FormatInt(mins, 10) + " min"
	default:
		return strconv.FormatInt(s, 10) + " s"
	}
}
