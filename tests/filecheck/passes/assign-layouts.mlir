// RUN: tkc opt %s -p assign-layouts | filecheck %s

// mma operands get the fragment layouts mma.m16n8k16 reads: A row, B of mma_AB col, B of mma_ABt row, the
// accumulator row; loads from shared memory take whatever their user needs, and row vectors of a row-layout
// tile are `align`.

// CHECK-LABEL: func.func @attention_step(
// CHECK:         %k = tile.load %k_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16, row>
// CHECK:         %v = tile.load %v_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16, col>
// CHECK:         %s = tile.mma_ABt %q, %k, %z : !tile.rt<16x64xbf16, row>, !tile.rt<64x64xbf16, row>, !tile.rt<16x64xf32, row>
// CHECK:         %m = tile.row_max %s : !tile.rt<16x64xf32, row> -> !tile.rv<16xf32, align>
// CHECK:         %p = tile.sub_row %s, %m : !tile.rt<16x64xf32, row>, !tile.rv<16xf32, align>
// CHECK:         %o = tile.mma_AB %pb, %v, %z : !tile.rt<16x64xbf16, row>, !tile.rt<64x64xbf16, col>, !tile.rt<16x64xf32, row>
func.func @attention_step(%q: !tile.rt<16x64xbf16>, %k_s: !tile.st<64x64xbf16>, %v_s: !tile.st<64x64xbf16>, %c0: i32) {
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %k = tile.load %k_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16>
  %v = tile.load %v_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16>
  %s = tile.mma_ABt %q, %k, %z : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
  %m = tile.row_max %s : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
  %p = tile.sub_row %s, %m : !tile.rt<16x64xf32>, !tile.rv<16xf32>
  %pb = tile.convert %p : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
  %o = tile.mma_AB %pb, %v, %z : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
  func.return
}

// A tile used as B of mma_AB and as A of another mma needs both layouts: one use gets a relayout.
// CHECK-LABEL: func.func @two_roles(
// CHECK:         tile.mma_AB %a, %b
// CHECK:         %[[T:.*]] = tile.relayout %b : !tile.rt<16x16xbf16, col> -> !tile.rt<16x16xbf16, row>
// CHECK:         tile.mma_AB %[[T]],
func.func @two_roles(%a: !tile.rt<16x16xbf16>, %b: !tile.rt<16x16xbf16>) {
  %z = tile.fill 0.0 : !tile.rt<16x16xf32>
  %x = tile.mma_AB %a, %b, %z : !tile.rt<16x16xbf16>, !tile.rt<16x16xbf16>, !tile.rt<16x16xf32>
  %y = tile.mma_AB %b, %a, %z : !tile.rt<16x16xbf16>, !tile.rt<16x16xbf16>, !tile.rt<16x16xf32>
  func.return
}

// A vector that meets no tile is `naive`; transpose flips the layout.
// CHECK-LABEL: func.func @vectors_and_transpose(
// CHECK:         %v = tile.load %g[%c0] : !tile.gl<?xf32> -> !tile.rv<64xf32, naive>
// CHECK:         %tt = tile.transpose %t : !tile.rt<16x32xbf16, col> -> !tile.rt<32x16xbf16, row>
func.func @vectors_and_transpose(%g: !tile.gl<?xf32>, %c0: i32, %t: !tile.rt<16x32xbf16>, %b: !tile.rt<16x16xbf16>) {
  %v = tile.load %g[%c0] : !tile.gl<?xf32> -> !tile.rv<64xf32>
  %s = tile.vec_sum %v : !tile.rv<64xf32>
  %tt = tile.transpose %t : !tile.rt<16x32xbf16> -> !tile.rt<32x16xbf16>
  %z = tile.fill 0.0 : !tile.rt<32x16xf32>
  %x = tile.mma_AB %tt, %b, %z : !tile.rt<32x16xbf16>, !tile.rt<16x16xbf16>, !tile.rt<32x16xf32>
  func.return
}

// A tile loaded from shared memory that a second mma needs in the other layout is loaded again there (ldmatrix
// or ldmatrix.trans) rather than relaid out in registers: no shuffles, and the first load's registers need not
// live until the second use.
// CHECK-LABEL: func.func @reloaded(
// CHECK:         %k = tile.load %k_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16, row>
// CHECK:         tile.mma_ABt %q, %k, %z
// CHECK-NOT:     tile.relayout
// CHECK:         %[[K:.*]] = tile.load %k_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16, col>
// CHECK:         tile.mma_AB %pb, %[[K]], %z
func.func @reloaded(%q: !tile.rt<16x64xbf16>, %k_s: !tile.st<64x64xbf16>, %c0: i32) {
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %k = tile.load %k_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16>
  %s = tile.mma_ABt %q, %k, %z : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
  %pb = tile.convert %s : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
  %o = tile.mma_AB %pb, %k, %z : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
  func.return
}

// Not where shared memory may have changed in between (here a ring's next stage is read: a copy may have landed):
// the registers are relaid out.
// CHECK-LABEL: func.func @not_reloaded_across_a_write(
// CHECK:         tile.insert
// CHECK:         %[[K:.*]] = tile.relayout %k : !tile.rt<64x64xbf16, row> -> !tile.rt<64x64xbf16, col>
// CHECK:         tile.mma_AB %pb, %[[K]], %z
func.func @not_reloaded_across_a_write(%q: !tile.rt<16x64xbf16>, %k_s: !tile.st<64x64xbf16>, %c0: i32) {
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %k = tile.load %k_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16>
  %s = tile.mma_ABt %q, %k, %z : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
  %pb = tile.convert %s : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
  %k_s2 = tile.insert %pb, %k_s[%c0, %c0] : !tile.rt<16x64xbf16> -> !tile.st<64x64xbf16>
  %o = tile.mma_AB %pb, %k, %z : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
  func.return
}

// Tiles that meet only global loads and stores and elementwise ops take the linear layout (8 consecutive columns
// of a row a lane: 16-byte accesses); a row sum, or fewer than 32 columns, keep the group in the row layout.
// CHECK-LABEL: func.func @elementwise(
// CHECK:         %x = tile.load %g[%c0, %c0] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xbf16, linear>
// CHECK:         %xf = tile.convert %x : !tile.rt<16x64xbf16, linear> -> !tile.rt<16x64xf32, linear>
// CHECK:         %y = tile.mul %xf, %xf : !tile.rt<16x64xf32, linear>
// CHECK:         tile.store %y, %g[%c0, %c0] : !tile.rt<16x64xf32, linear> -> !tile.gl<?x?xbf16>
// CHECK:         %s = tile.load %g[%c0, %c0] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32, row>
// CHECK:         tile.row_sum %s
// CHECK:         %n = tile.load %g[%c0, %c0] : !tile.gl<?x?xbf16> -> !tile.rt<16x16xf32, row>
func.func @elementwise(%g: !tile.gl<?x?xbf16>, %c0: i32) {
  %x = tile.load %g[%c0, %c0] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xbf16>
  %xf = tile.convert %x : !tile.rt<16x64xbf16> -> !tile.rt<16x64xf32>
  %y = tile.mul %xf, %xf : !tile.rt<16x64xf32>
  tile.store %y, %g[%c0, %c0] : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
  %s = tile.load %g[%c0, %c0] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
  %r = tile.row_sum %s : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
  %n = tile.load %g[%c0, %c0] : !tile.gl<?x?xbf16> -> !tile.rt<16x16xf32>
  %m = tile.add %n, %n : !tile.rt<16x16xf32>
  tile.store %m, %g[%c0, %c0] : !tile.rt<16x16xf32> -> !tile.gl<?x?xbf16>
  func.return
}
