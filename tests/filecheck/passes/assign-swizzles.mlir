// RUN: tkc opt %s -p assign-swizzles | filecheck %s

// The widest swizzle whose panel width divides a row: 128 bytes for 64 bf16 columns, 64 for 32, 32 for 16; rings
// of shared tiles get the same.

// CHECK-LABEL: func.func @widths(
// CHECK:         tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>
// CHECK:         tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x32xbf16, swizzle 64>
// CHECK:         tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x16xbf16, swizzle 32>
// CHECK:         tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x128xbf16, swizzle 128>
// CHECK:         tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>
func.func @widths(%g: !tile.gl<?x?xbf16>, %i: i32) {
  %a = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
  %b = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x32xbf16>
  %c = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x16xbf16>
  %d = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x128xbf16>
  %r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
  func.return
}
