package capture

import "testing"

func TestScratchLoad(t *testing.T) {
	var o captureObjects
	if err := loadCaptureObjects(&o, nil); err != nil {
		t.Fatalf("%+v", err)
	}
	o.Close()
}
