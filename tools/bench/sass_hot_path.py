"""Instructions on the common path of a kernel's SASS (nvdisasm output), a
static stand-in for instructions issued per thread where no GPU is at hand.

The walk starts at the kernel's entry: a predicated EXIT is not taken; a
forward conditional BRA skips its body [branch + 1, target) exactly when the
body's own common path runs into a CALL (div.rn / rcp.rn slow paths) or a
loop (a backward branch: e.g. padding loops), else falls into the body; a
backward conditional BRA is not taken. Fully unrolled kernels (the MX
quantizer's) are then one straight path, and count / (elements per thread)
is instructions an element.

    nvdisasm kernel.cubin > k.sass
    python3 tools/bench/sass_hot_path.py [-v] k.sass...   # -v: the branch decisions and the opcode mix
"""
import collections
import re
import sys

INSTRUCTION = re.compile(r'^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;')
LABEL = re.compile(r'^(\.L_x_\d+):')


def parse(path):
    """The first kernel's instructions and its labels (label -> index)."""
    instructions, labels, pending, inside = [], {}, [], False
    for line in open(path).read().splitlines():
        if not inside:
            inside = line.startswith('.text.') and line.endswith(':')
            continue
        if line.startswith('//-----'):
            break
        label = LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        instruction = INSTRUCTION.match(line)
        if instruction:
            for name in pending:
                labels[name] = len(instructions)
            pending = []
            instructions.append(instruction.group(2))
    return instructions, labels


def opcode(instruction):
    return re.sub(r'^@!?U?P\w+\s+', '', instruction).split()[0]


def target(instruction):
    return re.search(r'`\((\.L_x_\d+)\)', instruction).group(1)


def walk(instructions, labels, pc, end, log):
    """The common path from pc to end (or an EXIT): (instructions, cold), cold
    when it met a CALL or a loop."""
    path, cold = [], False
    while pc < len(instructions) and pc != end:
        instruction = instructions[pc]
        op = opcode(instruction)
        path.append(instruction)
        predicated = instruction.startswith('@')
        if op.startswith('CALL'):
            return path, True
        if op in ('EXIT', 'RET') and not predicated:
            return path, cold
        if op.startswith('RET'):
            return path, True
        if op == 'BRA':
            to = labels[target(instruction)]
            if not predicated:
                if to <= pc:
                    return path, True
                if end is not None and to > end:
                    return path, cold  # leaves the region: it joins later
                pc = to
                continue
            if to <= pc:  # a loop's back edge: not taken, but the region is cold
                cold = True
                pc += 1
                continue
            _, body_cold = walk(instructions, labels, pc + 1, to, None)
            if log is not None:
                log.append((pc, instruction, 'taken' if body_cold else 'falls through'))
            pc = to if body_cold else pc + 1
            continue
        pc += 1
    return path, cold


def main():
    verbose = '-v' in sys.argv
    for path in [a for a in sys.argv[1:] if a != '-v']:
        instructions, labels = parse(path)
        log = []
        hot, _ = walk(instructions, labels, 0, None, log)
        print(f'{len(hot):6d} {path}')
        if verbose:
            for entry in log:
                print('   ', *entry)
            print('   ', dict(collections.Counter(opcode(i).split('.')[0] for i in hot).most_common()))


if __name__ == '__main__':
    main()
