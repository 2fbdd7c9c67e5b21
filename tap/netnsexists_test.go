package tap

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestNetnsExistsSaysWhose: a taken name's error names the ipoib process
// whose marker claims it and whether it runs, or that no marker does.
func TestNetnsExistsSaysWhose(t *testing.T) {
	o := &Owner{MarkerDir: t.TempDir()}
	me, err := selfMarker()
	if err != nil {
		t.Fatal(err)
	}
	gone := ownerMarker{PID: me.PID, Start: me.Start + 1} // our pid, another start: a process that is gone
	for _, tc := range []struct {
		name   string
		marker []byte
		want   string
	}{
		{"ipoib-x1", me.marshal(), "create netns ipoib-x1: file already exists (made by ipoib process " + itoa(me.PID) + ", which is running)"},
		{"ipoib-x2", gone.marshal(), "create netns ipoib-x2: file already exists (made by ipoib process " + itoa(me.PID) + ", which is gone)"},
		{"ipoib-x3", nil, "create netns ipoib-x3: file already exists (no ipoib owner marker: not made by ipoib)"},
		{"ipoib-x4", []byte("not a marker\n"), "create netns ipoib-x4: file already exists (no ipoib owner marker: not made by ipoib)"},
	} {
		if tc.marker != nil {
			if err := os.WriteFile(filepath.Join(o.MarkerDir, tc.name), tc.marker, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		err := o.exists(tc.name)
		var ne *NetnsExistsError
		if !errors.Is(err, fs.ErrExist) || !errors.As(err, &ne) || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q (an fs.ErrExist)", tc.name, err, tc.want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
