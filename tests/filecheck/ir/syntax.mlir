// RUN: tkc opt %s | filecheck %s

// The custom syntax of every type and op family prints back as written; IR in the generic format (what
// `Printer(print_generic_format=True)` writes) reads back and prints in the custom syntax.

// Every type prints as it was written: unassigned layouts and swizzles print nothing, assigned ones (swizzle 0
// included) print after a comma.

// CHECK-LABEL: func.func @types(
// CHECK-SAME: %rt: !tile.rt<16x64xbf16>, %rt_row: !tile.rt<16x64xf32, row>, %rt_col: !tile.rt<64x16xf16, col>,
// CHECK-SAME: %rv: !tile.rv<16xf32>, %rv_align: !tile.rv<16xf32, align>, %rv_ortho: !tile.rv<64xbf16, ortho>,
// CHECK-SAME: %rv_naive: !tile.rv<32xf16, naive>,
// CHECK-SAME: %st: !tile.st<64x128xbf16>, %sw0: !tile.st<64x64xbf16, swizzle 0>, %sw32: !tile.st<64x64xf16, swizzle 32>,
// CHECK-SAME: %sw64: !tile.st<64x64xf32, swizzle 64>, %sw128: !tile.st<64x64xbf16, swizzle 128>,
// CHECK-SAME: %sv: !tile.sv<64xf32>,
// CHECK-SAME: %gl1: !tile.gl<?xf32>, %gl4: !tile.gl<?x?x?x?xbf16>, %gl_static: !tile.gl<8x?xf16>, %gl_empty: !tile.gl<0x4x?xbf16>)
func.func @types(%rt: !tile.rt<16x64xbf16>, %rt_row: !tile.rt<16x64xf32, row>, %rt_col: !tile.rt<64x16xf16, col>,
                 %rv: !tile.rv<16xf32>, %rv_align: !tile.rv<16xf32, align>, %rv_ortho: !tile.rv<64xbf16, ortho>,
                 %rv_naive: !tile.rv<32xf16, naive>,
                 %st: !tile.st<64x128xbf16>, %sw0: !tile.st<64x64xbf16, swizzle 0>, %sw32: !tile.st<64x64xf16, swizzle 32>,
                 %sw64: !tile.st<64x64xf32, swizzle 64>, %sw128: !tile.st<64x64xbf16, swizzle 128>,
                 %sv: !tile.sv<64xf32>,
                 %gl1: !tile.gl<?xf32>, %gl4: !tile.gl<?x?x?x?xbf16>, %gl_static: !tile.gl<8x?xf16>, %gl_empty: !tile.gl<0x4x?xbf16>) {
  func.return
}

// Types written with extra spaces print in the canonical form.
// CHECK-LABEL: func.func @spacing(
// CHECK-SAME: %a: !tile.rt<16x16xf32, row>, %b: !tile.st<64x64xbf16, swizzle 128>
func.func @spacing(%a: !tile.rt< 16x16xf32 ,  row >, %b: !tile.st<64x64xbf16,swizzle   128>) {
  func.return
}

// CHECK-LABEL: func.func @grid(
// CHECK-NEXT:    %x = tile.block_idx x
// CHECK-NEXT:    %y = tile.num_blocks y
// CHECK-NEXT:    %z = tile.block_idx z {tkc.note = 1 : i64}
// CHECK-NEXT:    %w = tile.warp_id
// CHECK-NEXT:    %wg = tile.warpgroup_id
// CHECK-NEXT:    %n = tile.dim %g[3] : !tile.gl<?x?x?x?xbf16>
// CHECK-NEXT:    tile.barrier
func.func @grid(%g: !tile.gl<?x?x?x?xbf16>) {
  %x = tile.block_idx x
  %y = tile.num_blocks y
  %z = tile.block_idx z {tkc.note = 1 : i64}
  %w = tile.warp_id
  %wg = tile.warpgroup_id
  %n = tile.dim %g[3] : !tile.gl<?x?x?x?xbf16>
  tile.barrier
  func.return
}

// Fill values print so that they read back exactly (1.0e-5 prints as 1.0e-05, not as repr's unparsable 1e-05).
// CHECK-LABEL: func.func @fills(
// CHECK-NEXT:    %a = tile.fill 0.0 : !tile.rt<16x64xf32>
// CHECK-NEXT:    %b = tile.fill -inf : !tile.rv<16xf32>
// CHECK-NEXT:    %c = tile.fill nan : !tile.rt<16x16xbf16, col>
// CHECK-NEXT:    %d = tile.fill 1.0e-05 : !tile.sv<64xf32>
// CHECK-NEXT:    %e = tile.fill 2.0 : !tile.st<64x64xf16, swizzle 128>
// CHECK-NEXT:    %f = tile.fill -0.0 : !tile.rv<16xf32, align>
// CHECK-NEXT:    %s = tile.empty : !tile.st<64x64xbf16>
// CHECK-NEXT:    %v = tile.empty : !tile.sv<64xbf16>
func.func @fills() {
  %a = tile.fill 0.0 : !tile.rt<16x64xf32>
  %b = tile.fill -inf : !tile.rv<16xf32>
  %c = tile.fill nan : !tile.rt<16x16xbf16, col>
  %d = tile.fill 1.0e-5 : !tile.sv<64xf32>
  %e = tile.fill 2 : !tile.st<64x64xf16, swizzle 128>
  %f = tile.fill -0.0 : !tile.rv<16xf32, align>
  %s = tile.empty : !tile.st<64x64xbf16>
  %v = tile.empty : !tile.sv<64xbf16>
  func.return
}

// A scalar operand prints its type after the tile's; two tiles print one type.
// CHECK-LABEL: func.func @elementwise(
// CHECK-NEXT:    %a = tile.exp2 %t : !tile.rt<16x64xf32>
// CHECK-NEXT:    %b = tile.rsqrt %v : !tile.rv<16xf32>
// CHECK-NEXT:    %c = tile.add %t, %a : !tile.rt<16x64xf32>
// CHECK-NEXT:    %d = tile.mul %t, %s : !tile.rt<16x64xf32>, f32
// CHECK-NEXT:    %e = tile.max %s, %v : f32, !tile.rv<16xf32>
// CHECK-NEXT:    %f = tile.sub_row %t, %v : !tile.rt<16x64xf32>, !tile.rv<16xf32>
// CHECK-NEXT:    %g = tile.broadcast_col %w : !tile.rv<64xf32> -> !tile.rt<16x64xf32>
// CHECK-NEXT:    %h = tile.tril %t, %i fill -inf : !tile.rt<16x64xf32>
// CHECK-NEXT:    %k = tile.triu %t, %i fill 0.0 : !tile.rt<16x64xf32>
func.func @elementwise(%t: !tile.rt<16x64xf32>, %v: !tile.rv<16xf32>, %w: !tile.rv<64xf32>, %s: f32, %i: i32) {
  %a = tile.exp2 %t : !tile.rt<16x64xf32>
  %b = tile.rsqrt %v : !tile.rv<16xf32>
  %c = tile.add %t, %a : !tile.rt<16x64xf32>
  %d = tile.mul %t, %s : !tile.rt<16x64xf32>, f32
  %e = tile.max %s, %v : f32, !tile.rv<16xf32>
  %f = tile.sub_row %t, %v : !tile.rt<16x64xf32>, !tile.rv<16xf32>
  %g = tile.broadcast_col %w : !tile.rv<64xf32> -> !tile.rt<16x64xf32>
  %h = tile.tril %t, %i fill -inf : !tile.rt<16x64xf32>
  %k = tile.triu %t, %i fill 0.0 : !tile.rt<16x64xf32>
  func.return
}

// CHECK-LABEL: func.func @reductions(
// CHECK-NEXT:    %m = tile.row_max %t : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
// CHECK-NEXT:    %l = tile.row_sum %t, %m : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
// CHECK-NEXT:    %c = tile.col_prod %t : !tile.rt<16x64xf32> -> !tile.rv<64xf32>
// CHECK-NEXT:    %s = tile.vec_sum %l : !tile.rv<16xf32>
func.func @reductions(%t: !tile.rt<16x64xf32>) {
  %m = tile.row_max %t : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
  %l = tile.row_sum %t, %m : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
  %c = tile.col_prod %t : !tile.rt<16x64xf32> -> !tile.rv<64xf32>
  %s = tile.vec_sum %l : !tile.rv<16xf32>
  func.return
}

// CHECK-LABEL: func.func @conversions_and_mma(
// CHECK-NEXT:    %q = tile.convert %a : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
// CHECK-NEXT:    %r = tile.relayout %q : !tile.rt<16x64xbf16> -> !tile.rt<16x64xbf16, row>
// CHECK-NEXT:    %k = tile.transpose %q : !tile.rt<16x64xbf16> -> !tile.rt<64x16xbf16>
// CHECK-NEXT:    %s = tile.mma_ABt %q, %q, %c : !tile.rt<16x64xbf16>, !tile.rt<16x64xbf16>, !tile.rt<16x16xf32>
// CHECK-NEXT:    %o = tile.mma_AB %q, %k, %c : !tile.rt<16x64xbf16>, !tile.rt<64x16xbf16>, !tile.rt<16x16xf32>
// CHECK-NEXT:    %p = tile.mma_AtB %k, %k, %c : !tile.rt<64x16xbf16>, !tile.rt<64x16xbf16>, !tile.rt<16x16xf32>
// CHECK-NEXT:    %u = tile.mma_AtBt %k, %q, %c : !tile.rt<64x16xbf16>, !tile.rt<16x64xbf16>, !tile.rt<16x16xf32>
func.func @conversions_and_mma(%a: !tile.rt<16x64xf32>, %c: !tile.rt<16x16xf32>) {
  %q = tile.convert %a : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
  %r = tile.relayout %q : !tile.rt<16x64xbf16> -> !tile.rt<16x64xbf16, row>
  %k = tile.transpose %q : !tile.rt<16x64xbf16> -> !tile.rt<64x16xbf16>
  %s = tile.mma_ABt %q, %q, %c : !tile.rt<16x64xbf16>, !tile.rt<16x64xbf16>, !tile.rt<16x16xf32>
  %o = tile.mma_AB %q, %k, %c : !tile.rt<16x64xbf16>, !tile.rt<64x16xbf16>, !tile.rt<16x16xf32>
  %p = tile.mma_AtB %k, %k, %c : !tile.rt<64x16xbf16>, !tile.rt<64x16xbf16>, !tile.rt<16x16xf32>
  %u = tile.mma_AtBt %k, %q, %c : !tile.rt<64x16xbf16>, !tile.rt<16x64xbf16>, !tile.rt<16x16xf32>
  func.return
}

// Loads, stores and atomic adds by row numbers (rows_at): rows %p[%i], %p[%i + 1], ... of %g; into a shared tile
// too, and the asynchronous copy a pipelined loop makes of such a load. An element of an int32 tensor read as an
// i32 (tile.read), and loads and stores whose rows end there (rows_end).
// CHECK-LABEL: func.func @gather(
// CHECK-NEXT:    %t = tile.load %g[%i, %i] rows_at %p : !tile.gl<?xi64> {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
// CHECK-NEXT:    tile.store %t, %g[%i, %i] rows_at %q : !tile.gl<?xi32> {tile.index_in_rows} : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
// CHECK-NEXT:    tile.atomic_add %t, %f[%i, %i] rows_at %p : !tile.gl<?xi64> {tile.index_in_rows} : !tile.rt<16x64xf32> -> !tile.gl<?x?xf32>
// CHECK-NEXT:    %s = tile.load %g[%i, %i] rows_at %q : !tile.gl<?xi32> {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
// CHECK-NEXT:    %r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
// CHECK-NEXT:    tile.copy_async %g[%i, %i] rows_at %q : !tile.gl<?xi32>, %r[%i] {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.ring<3, !tile.st<64x64xbf16>>
// CHECK-NEXT:    %e = tile.read %q[%i] : !tile.gl<?xi32>
// CHECK-NEXT:    %u = tile.load %g[%i, %i] rows_end %e {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
// CHECK-NEXT:    tile.store %u, %g[%i, %i] rows_at %q : !tile.gl<?xi32> rows_end %e {tile.index_in_rows} : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
// CHECK-NEXT:    tile.copy_async %g[%i, %i] rows_at %q : !tile.gl<?xi32> rows_end %e, %r[%i] {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.ring<3, !tile.st<64x64xbf16>>
func.func @gather(%g: !tile.gl<?x?xbf16>, %f: !tile.gl<?x?xf32>, %p: !tile.gl<?xi64>, %q: !tile.gl<?xi32>, %i: i32) {
  %t = tile.load %g[%i, %i] rows_at %p : !tile.gl<?xi64> {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
  tile.store %t, %g[%i, %i] rows_at %q : !tile.gl<?xi32> {tile.index_in_rows} : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
  tile.atomic_add %t, %f[%i, %i] rows_at %p : !tile.gl<?xi64> {tile.index_in_rows} : !tile.rt<16x64xf32> -> !tile.gl<?x?xf32>
  %s = tile.load %g[%i, %i] rows_at %q : !tile.gl<?xi32> {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
  %r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
  tile.copy_async %g[%i, %i] rows_at %q : !tile.gl<?xi32>, %r[%i] {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.ring<3, !tile.st<64x64xbf16>>
  %e = tile.read %q[%i] : !tile.gl<?xi32>
  %u = tile.load %g[%i, %i] rows_end %e {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
  tile.store %u, %g[%i, %i] rows_at %q : !tile.gl<?xi32> rows_end %e {tile.index_in_rows} : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
  tile.copy_async %g[%i, %i] rows_at %q : !tile.gl<?xi32> rows_end %e, %r[%i] {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.ring<3, !tile.st<64x64xbf16>>
  func.return
}

// CHECK-LABEL: func.func @memory(
// CHECK-NEXT:    %s = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>
// CHECK-NEXT:    %t = tile.load %s[%i, %i] : !tile.st<64x64xbf16, swizzle 128> -> !tile.rt<16x64xf32>
// CHECK-NEXT:    %v = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rv<64xf32>
// CHECK-NEXT:    %s2 = tile.insert %t, %s[%i, %i] : !tile.rt<16x64xf32> -> !tile.st<64x64xbf16, swizzle 128>
// CHECK-NEXT:    tile.store %s2, %g[%i, %i] : !tile.st<64x64xbf16, swizzle 128> -> !tile.gl<?x?xbf16>
// CHECK-NEXT:    tile.store %v, %g[%i, %i] : !tile.rv<64xf32> -> !tile.gl<?x?xbf16>
func.func @memory(%g: !tile.gl<?x?xbf16>, %i: i32) {
  %s = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>
  %t = tile.load %s[%i, %i] : !tile.st<64x64xbf16, swizzle 128> -> !tile.rt<16x64xf32>
  %v = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rv<64xf32>
  %s2 = tile.insert %t, %s[%i, %i] : !tile.rt<16x64xf32> -> !tile.st<64x64xbf16, swizzle 128>
  tile.store %s2, %g[%i, %i] : !tile.st<64x64xbf16, swizzle 128> -> !tile.gl<?x?xbf16>
  tile.store %v, %g[%i, %i] : !tile.rv<64xf32> -> !tile.gl<?x?xbf16>
  func.return
}

// A function in the generic format.
// CHECK-LABEL: func.func @generic(
// CHECK-NEXT:    %x = tile.block_idx y
// CHECK-NEXT:    %n = tile.dim %g[1] : !tile.gl<?x?xbf16>
// CHECK-NEXT:    %t = tile.load %g[%x, %n] : !tile.gl<?x?xbf16> -> !tile.rt<16x32xf32>
// CHECK-NEXT:    %z = tile.fill -inf : !tile.rv<16xf32>
// CHECK-NEXT:    %m = tile.row_max %t, %z : !tile.rt<16x32xf32> -> !tile.rv<16xf32>
// CHECK-NEXT:    %p = tile.sub_row %t, %m : !tile.rt<16x32xf32>, !tile.rv<16xf32>
// CHECK-NEXT:    %q = tile.tril %p, %x fill 1.0e-05 : !tile.rt<16x32xf32>
// CHECK-NEXT:    tile.store %q, %g[%x, %n] : !tile.rt<16x32xf32> -> !tile.gl<?x?xbf16>
// CHECK-NEXT:    func.return
"func.func"() <{sym_name = "generic", function_type = (!tile.gl<?x?xbf16>) -> ()}> ({
^bb0(%g : !tile.gl<?x?xbf16>):
  %x = "tile.block_idx"() <{dim = 1 : i64}> : () -> i32
  %n = "tile.dim"(%g) <{index = 1 : i64}> : (!tile.gl<?x?xbf16>) -> i32
  %t = "tile.load"(%g, %x, %n) <{operandSegmentSizes = array<i32: 1, 2, 0, 0>}> : (!tile.gl<?x?xbf16>, i32, i32) -> !tile.rt<16x32xf32>
  %z = "tile.fill"() <{value = 0xFFF0000000000000 : f64}> : () -> !tile.rv<16xf32>
  %m = "tile.row_max"(%t, %z) : (!tile.rt<16x32xf32>, !tile.rv<16xf32>) -> !tile.rv<16xf32>
  %p = "tile.sub_row"(%t, %m) : (!tile.rt<16x32xf32>, !tile.rv<16xf32>) -> !tile.rt<16x32xf32>
  %q = "tile.tril"(%p, %x) <{fill = 1.000000e-05 : f64}> : (!tile.rt<16x32xf32>, i32) -> !tile.rt<16x32xf32>
  "tile.store"(%q, %g, %x, %n) <{operandSegmentSizes = array<i32: 1, 1, 2, 0, 0>}> : (!tile.rt<16x32xf32>, !tile.gl<?x?xbf16>, i32, i32) -> ()
  "func.return"() : () -> ()
}) : () -> ()
