//! `tinyllm-native`: the command-line front end of the engine.

fn main() {
    println!("tinyllm-native");
}
