// `#[outbox_handler]` on an impl block instead of on its method: the macro
// says it wants a function, and keeps the block, so the mistake in the method
// (`usize` returned as `i64`) is reported in the same build.
use txoutbox_core::outbox_handler;

pub struct Order {
    pub lines: Vec<i64>,
}

#[outbox_handler]
impl Order {
    pub fn line_count(&self) -> i64 {
        self.lines.len()
    }
}

fn main() {
    let _ = Order { lines: Vec::new() }.line_count();
}
