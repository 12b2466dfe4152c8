// RUN: tkc opt %s --print-debuginfo | filecheck %s

// Source locations of ops and of function arguments survive parsing and printing.

// CHECK:       func.func @located(%x: !tile.gl<?x?xbf16> loc("kernel.py":3:14)
// CHECK:         %t = tile.load %x[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rt<16x16xf32> loc("kernel.py":5:9)
// CHECK-NEXT:    %u = tile.exp2 %t : !tile.rt<16x16xf32> loc("kernel.py":6:9)
// CHECK-NEXT:    %v = tile.tril %u, %i fill -inf : !tile.rt<16x16xf32> loc("kernel.py":7:9)
// CHECK-NEXT:    tile.store %v, %x[%i, %i] : !tile.rt<16x16xf32> -> !tile.gl<?x?xbf16> loc("kernel.py":8:5)
func.func @located(%x: !tile.gl<?x?xbf16> loc("kernel.py":3:14), %i: i32 loc("kernel.py":3:40)) {
  %t = tile.load %x[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rt<16x16xf32> loc("kernel.py":5:9)
  %u = tile.exp2 %t : !tile.rt<16x16xf32> loc("kernel.py":6:9)
  %v = tile.tril %u, %i fill -inf : !tile.rt<16x16xf32> loc("kernel.py":7:9)
  tile.store %v, %x[%i, %i] : !tile.rt<16x16xf32> -> !tile.gl<?x?xbf16> loc("kernel.py":8:5)
  func.return loc("kernel.py":8:5)
}
