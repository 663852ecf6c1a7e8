//go:build !linux

package secrets

import "errors"

// changeWatch is Linux's (inotify); elsewhere the file is checked on every
// read.
type changeWatch struct{}

func newChangeWatch(string, *poller) (*changeWatch, error) {
	return nil, errors.New("no change watch on this system")
}

func (*changeWatch) changed() bool { return true }
func (*changeWatch) close()        {}

type poller struct{}

func newPoller() (*poller, error) { return nil, errors.New("no change watch on this system") }

func (*poller) poll() (ready, only bool) { return true, true }
func (*poller) close()                   {}
