package history

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// explain logs, for each partition (key), the end of its longest partial linearization, the
// model states after it, and the earliest-returning operations that could not be added next:
// where the model got stuck.
func explain(t *testing.T, model porcupine.Model, history []porcupine.Operation, info porcupine.LinearizationInfo) {
	parts := model.Partition(history)
	for p, partials := range info.PartialLinearizations() {
		if p >= len(parts) || len(partials) == 0 {
			continue
		}
		part := parts[p]
		var longest []int
		for _, l := range partials {
			if len(l) > len(longest) {
				longest = l
			}
		}
		if len(longest) == len(part) {
			continue
		}
		state := model.Init()
		done := map[int]bool{}
		for _, i := range longest {
			_, state = model.Step(state, part[i].Input, part[i].Output)
			done[i] = true
		}
		t.Logf("key %s: stuck after %d of %d operations; tail:", part[0].Input.(callInput).Key, len(longest), len(part))
		for _, i := range longest[max(0, len(longest)-5):] {
			op := part[i]
			t.Logf("  [%d,%d]ms c%d %s", op.Call/1e6, op.Return/1e6, op.ClientId, model.DescribeOperation(op.Input, op.Output))
		}
		t.Logf("  state: %s", model.DescribeState(state))
		minRet := int64(-1)
		for i, op := range part {
			if !done[i] && (minRet < 0 || op.Return < minRet) {
				minRet = op.Return
			}
		}
		for i, op := range part {
			if !done[i] && op.Call <= minRet {
				t.Logf("  candidate [%d,%d]ms c%d %s", op.Call/1e6, op.Return/1e6, op.ClientId, model.DescribeOperation(op.Input, op.Output))
			}
		}
	}
}
