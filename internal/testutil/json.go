package testutil

import "testing"

// JSONNumber is the number at path in v, a JSON document decoded into
// any (such as one interface's stats in 'ipoib show --json'); it fails the
// test if the path is missing or does not end at a number.
func JSONNumber(t testing.TB, v any, path ...string) float64 {
	t.Helper()
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("JSON lacks %v", path)
		}
		v = m[k]
	}
	f, ok := v.(float64)
	if !ok {
		t.Fatalf("JSON %v = %v, not a number", path, v)
	}
	return f
}
