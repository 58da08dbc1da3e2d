fn main() {
    eprintln!("sandhold: the control plane is not built yet (see the open issues)");
    std::process::exit(2);
}
