package capture

import "encoding/binary"

func nativeUint16(b []byte) uint16 { return binary.NativeEndian.Uint16(b) }
func nativeUint32(b []byte) uint32 { return binary.NativeEndian.Uint32(b) }
