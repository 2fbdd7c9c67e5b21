package cli

import (
	"fmt"
	"io"
	"os"
)

// writePlotFile writes an SVG made by draw (a report's chart) to path.
func writePlotFile(path string, draw func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if err := draw(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}
