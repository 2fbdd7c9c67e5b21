package napi

import (
	"errors"
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
)

// Defaults for Config fields left zero. DefaultBudget is NAPI_POLL_WEIGHT and
// IPoIB's send weight (MAX_SEND_CQE); DefaultBatch amortises the CQ lock of a
// backend over a cache-friendly number of WCs.
const (
	DefaultBudget = 64
	DefaultBatch  = 16
)

// ErrInvalidConfig is wrapped by New's errors.
var ErrInvalidConfig = errors.New("invalid napi config")

// Config configures a Context.
type Config struct {
	// Name identifies the context in logs and statistics ("ib0-rx").
	Name string
	// CQ is the completion queue to poll. Its OnCompletion should call the
	// Context's Schedule.
	CQ hca.CQ
	// Budget is the most completions one poll handles before yielding
	// (default DefaultBudget).
	Budget int
	// Batch is the most WCs asked of one CQ.Poll call (default
	// DefaultBatch).
	Batch int
	// Handle processes a batch of completions. It is called with the poll
	// lock held, from the context's goroutine (or a BusyPoll caller's),
	// with 1..Batch completions.
	// The slice is reused for the next batch: Handle must not retain it.
	// Handle must not call Sync or Stop of its Context, nor block on
	// anything that waits for this Context's poll lock: each would wait
	// for the poll that is running Handle.
	Handle func(wcs []hca.WC)
	// Complete, if set, is called under the poll lock when a poll ends
	// having handled fewer completions than its Budget (or Stop
	// interrupted it), and once more by Stop after the last Handle: where
	// Linux's napi_complete_done flushes the GRO lists a driver kept
	// across polls that used their whole budget. A Handle that holds
	// work back while its batch was a whole Budget finishes it here. It
	// follows Handle's rules.
	Complete func()
	// Inline lets Schedule run the poll on the calling goroutine when no
	// poll is running, as a softirq runs NAPI on the CPU that raised it:
	// wired to a CQ with hca.CQConfig.InlineCompletion, the goroutine that
	// posted the send that completed (on the soft fabric, the peer's
	// sender) then hands the completion to Handle itself, saving the
	// poll goroutine's wake-up and a trip of the data to another core.
	// Handle, during such a poll (Context.Inline), must not block on a
	// lock a poster may hold; it hands what needs one back with
	// Context.Defer, and the poll goroutine handles it.
	Inline bool
}

// withDefaults validates c and fills in the defaults.
func (c Config) withDefaults() (Config, error) {
	if c.CQ == nil {
		return c, fmt.Errorf("napi %q: CQ is nil: %w", c.Name, ErrInvalidConfig)
	}
	if c.Handle == nil {
		return c, fmt.Errorf("napi %q: Handle is nil: %w", c.Name, ErrInvalidConfig)
	}
	if c.Budget < 0 {
		return c, fmt.Errorf("napi %q: Budget %d < 0: %w", c.Name, c.Budget, ErrInvalidConfig)
	}
	if c.Batch < 0 {
		return c, fmt.Errorf("napi %q: Batch %d < 0: %w", c.Name, c.Batch, ErrInvalidConfig)
	}
	if c.Budget == 0 {
		c.Budget = DefaultBudget
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	// A batch larger than the budget could never be asked for in full.
	c.Batch = min(c.Batch, c.Budget)
	return c, nil
}
